# partrain_launcher: the process side of `partrain run` (spawn, relay, watch, stop, restart
# the local ranks). LibTorch-free; Boost.Process and Boost.Asio are header-only on Linux.
if(WIN32)
  set(_platform_process platform_process_windows.cpp)
else()
  set(_platform_process platform_process_posix.cpp)
endif()
add_library(partrain_launcher STATIC
  ${CMAKE_CURRENT_LIST_DIR}/launcher.cpp
  ${CMAKE_CURRENT_LIST_DIR}/${_platform_process})
target_include_directories(partrain_launcher PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(partrain_launcher PUBLIC partrain_common partrain_node_layout Boost::headers
                      Threads::Threads ${CMAKE_DL_LIBS})
# Boost.DLL (this executable's path) header-only, on std::filesystem instead of Boost's.
target_compile_definitions(partrain_launcher PUBLIC BOOST_DLL_USE_STD_FS)
if(WIN32)
  # On Windows, Boost.Process turns char strings into the wide strings of CreateProcessW with
  # Boost.Filesystem's path, a compiled library (scripts/windows-check.sh builds it).
  # Boost 1.74's handle_workaround.hpp spells MSVC's __kernel_entry annotation, which
  # MinGW-w64 lacks; it means nothing to the compiler.
  find_library(PARTRAIN_BOOST_FILESYSTEM NAMES boost_filesystem REQUIRED)
  target_link_libraries(partrain_launcher PUBLIC ${PARTRAIN_BOOST_FILESYSTEM})
  target_compile_definitions(partrain_launcher PUBLIC BOOST_FILESYSTEM_STATIC_LINK=1
                             BOOST_ALL_NO_LIB __kernel_entry=)
endif()
