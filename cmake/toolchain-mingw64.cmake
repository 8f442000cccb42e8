# Cross-compiling for 64-bit Windows with Debian's MinGW-w64 (posix threads variant, which
# gives std::thread and std::mutex), running the results under Wine:
#   cmake -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-mingw64.cmake -DPARTRAIN_WINDOWS_DEPS=DIR ...
# PARTRAIN_WINDOWS_DEPS is the prefix holding the Windows builds of GoogleTest and yaml-cpp
# and the header-only libraries (scripts/windows-check.sh makes it). Only that prefix is
# searched for headers, libraries and packages: -I/usr/include would mix Linux's C library
# headers into a Windows build.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)

set(_triple x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${_triple}-gcc-posix)
set(CMAKE_CXX_COMPILER ${_triple}-g++-posix)
set(CMAKE_RC_COMPILER ${_triple}-windres)
set(CMAKE_AR ${_triple}-ar CACHE FILEPATH "")
set(CMAKE_RANLIB ${_triple}-ranlib CACHE FILEPATH "")

# Tests and test discovery run the .exe files through Wine.
find_program(PARTRAIN_WINE NAMES wine wine64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${PARTRAIN_WINE})

set(PARTRAIN_WINDOWS_DEPS "" CACHE PATH "Prefix with the Windows builds of the dependencies")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES PARTRAIN_WINDOWS_DEPS)
set(CMAKE_FIND_ROOT_PATH /usr/${_triple} ${PARTRAIN_WINDOWS_DEPS})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Static runtime: the .exe files run under Wine without MinGW's DLLs beside them. Asio needs
# Winsock (ws2_32) and the AcceptEx/ConnectEx extensions (mswsock).
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
set(CMAKE_CXX_STANDARD_LIBRARIES "-lws2_32 -lmswsock" CACHE STRING "")
# Windows 10 API level: Asio then uses the modern socket calls.
set(CMAKE_CXX_FLAGS_INIT "-D_WIN32_WINNT=0x0A00")
