# partrain_launcher: the process side of `partrain run` (spawn, relay, watch, stop, restart
# the local ranks). LibTorch-free; Boost.Process and Boost.Asio are header-only.
add_library(partrain_launcher STATIC
  ${CMAKE_CURRENT_LIST_DIR}/launcher.cpp
  ${CMAKE_CURRENT_LIST_DIR}/platform_process.cpp)
target_include_directories(partrain_launcher PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(partrain_launcher PUBLIC partrain_common Boost::headers Threads::Threads
                      ${CMAKE_DL_LIBS})
# Boost.DLL (this executable's path) header-only, on std::filesystem instead of Boost's.
target_compile_definitions(partrain_launcher PUBLIC BOOST_DLL_USE_STD_FS)
