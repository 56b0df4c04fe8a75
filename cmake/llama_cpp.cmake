# Provides the imported target `llama::llama` plus SEMIF_LLAMA_RUNTIME (shared libraries to
# ship) and SEMIF_LLAMA_SERVER (the llama-server binary, may be empty in "installed" mode).
#
# Mode (a) "source": SEMIF_LLAMA_SOURCE_DIR points at the pinned llama.cpp tree. It is built at
#   configure time into SEMIF_LLAMA_BUILD_DIR, a cache outside the repository, so that repeated
#   wheel builds only re-run an up-to-date `cmake --build` (seconds) instead of rebuilding ggml.
# Mode (b) "installed": SEMIF_LLAMA_LIB_DIR + SEMIF_LLAMA_INCLUDE_DIR name an existing libllama
#   (the DLC image's own build). Nothing of llama.cpp is copied into the wheel then.

set(SEMIF_LLAMA_SOURCE_DIR "" CACHE PATH "llama.cpp source tree to build (mode a)")
set(SEMIF_LLAMA_BUILD_DIR "" CACHE PATH "persistent build directory for mode a")
set(SEMIF_LLAMA_LIB_DIR "" CACHE PATH "directory holding an installed libllama (mode b)")
set(SEMIF_LLAMA_INCLUDE_DIR "" CACHE PATH "directory holding llama.h and ggml.h (mode b)")
set(SEMIF_LLAMA_SERVER_PATH "" CACHE FILEPATH "llama-server binary to ship (mode b, optional)")
option(SEMIF_CUDA "build llama.cpp with GGML_CUDA (mode a)" OFF)
set(SEMIF_CUDA_ARCHITECTURES "90" CACHE STRING
    "CMAKE_CUDA_ARCHITECTURES of the CUDA build, ';' ',' or ' ' between them\
 (90: H100/H200; 86: A10G; 89: L4/L40S)")
set(SEMIF_CUDA_LINK_FILE "" CACHE FILEPATH
    "file of -D arguments, one a line, that complete the CUDA toolkit for llama.cpp's\
 FindCUDAToolkit (cuBLAS, libcuda.so for linking): scripts/cuda_link_deps.py writes it")
set(SEMIF_LLAMA_BUILD_NUMBER "11312" CACHE STRING "llama.cpp build number of the pinned tree")
set(SEMIF_LLAMA_BUILD_COMMIT "0c1e570" CACHE STRING "llama.cpp commit of the pinned tree")

function(_semif_run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmdline)
    message(FATAL_ERROR "llama.cpp build step failed (exit ${rc}): ${cmdline}")
  endif()
endfunction()

if(SEMIF_LLAMA_SOURCE_DIR)
  if(NOT EXISTS "${SEMIF_LLAMA_SOURCE_DIR}/include/llama.h")
    message(FATAL_ERROR "SEMIF_LLAMA_SOURCE_DIR=${SEMIF_LLAMA_SOURCE_DIR} is not a llama.cpp tree")
  endif()
  if(NOT SEMIF_LLAMA_BUILD_DIR)
    message(FATAL_ERROR "mode (a) needs SEMIF_LLAMA_BUILD_DIR (a cache outside the repo)")
  endif()
  set(_opts
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=ON
    # One flat directory of binaries and libraries that find each other through $ORIGIN,
    # both in the build tree and once copied into the wheel.
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
    "-DCMAKE_INSTALL_RPATH=\$ORIGIN"
    -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON
    -DLLAMA_BUILD_NUMBER=${SEMIF_LLAMA_BUILD_NUMBER}
    -DLLAMA_BUILD_COMMIT=${SEMIF_LLAMA_BUILD_COMMIT}
    -DGGML_NATIVE=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_APP=OFF)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    # GGML_NATIVE=OFF would otherwise fall back to SSE only; x86-64-v3 is what every current
    # cloud CPU has. AVX-512/AMX stay off: native AMX kernels die with SIGILL on these hosts.
    list(APPEND _opts -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
         -DGGML_BMI2=ON)
  endif()
  if(SEMIF_CUDA)
    # Only the named compute capabilities (llama.cpp's default list is 7 architectures, ~7x
    # the compile time and size). Flash-attention kernels for the default KV types only.
    # The list goes through an initial-cache file: a ';' would split the -D argument here.
    string(REGEX REPLACE "[ ,;]+" ";" _archs "${SEMIF_CUDA_ARCHITECTURES}")
    file(MAKE_DIRECTORY "${SEMIF_LLAMA_BUILD_DIR}")
    file(WRITE "${SEMIF_LLAMA_BUILD_DIR}/semif-cuda-init.cmake"
         "set(CMAKE_CUDA_ARCHITECTURES \"${_archs}\" CACHE STRING \"semif\" FORCE)\n")
    list(APPEND _opts -DGGML_CUDA=ON -DGGML_CUDA_FA_ALL_QUANTS=OFF
         -C "${SEMIF_LLAMA_BUILD_DIR}/semif-cuda-init.cmake")
    if(SEMIF_CUDA_LINK_FILE)
      file(STRINGS "${SEMIF_CUDA_LINK_FILE}" _cuda_link REGEX "^-D")
      list(APPEND _opts ${_cuda_link})
    endif()
  endif()
  find_program(_ninja ninja)
  if(_ninja AND NOT EXISTS "${SEMIF_LLAMA_BUILD_DIR}/CMakeCache.txt")
    list(APPEND _opts -G Ninja)
  endif()
  message(STATUS "semif: building llama.cpp b${SEMIF_LLAMA_BUILD_NUMBER} in ${SEMIF_LLAMA_BUILD_DIR}")
  _semif_run(${CMAKE_COMMAND} -S "${SEMIF_LLAMA_SOURCE_DIR}" -B "${SEMIF_LLAMA_BUILD_DIR}" ${_opts})
  cmake_host_system_information(RESULT _ncpu QUERY NUMBER_OF_LOGICAL_CORES)
  _semif_run(${CMAKE_COMMAND} --build "${SEMIF_LLAMA_BUILD_DIR}" --target llama-server llama
             --parallel ${_ncpu})
  set(_bin "${SEMIF_LLAMA_BUILD_DIR}/bin")
  file(GLOB SEMIF_LLAMA_RUNTIME "${_bin}/lib*.so")
  set(SEMIF_LLAMA_SERVER "${_bin}/llama-server")
  set(_lib "${_bin}/libllama.so")
  set(_ggml "${_bin}/libggml.so")
  set(_inc "${SEMIF_LLAMA_SOURCE_DIR}/include" "${SEMIF_LLAMA_SOURCE_DIR}/ggml/include")
elseif(SEMIF_LLAMA_LIB_DIR AND SEMIF_LLAMA_INCLUDE_DIR)
  find_library(_lib NAMES llama PATHS "${SEMIF_LLAMA_LIB_DIR}" NO_DEFAULT_PATH REQUIRED)
  find_library(_ggml NAMES ggml PATHS "${SEMIF_LLAMA_LIB_DIR}" NO_DEFAULT_PATH REQUIRED)
  set(_inc "${SEMIF_LLAMA_INCLUDE_DIR}")
  set(SEMIF_LLAMA_RUNTIME "")
  set(SEMIF_LLAMA_SERVER "${SEMIF_LLAMA_SERVER_PATH}")
else()
  message(FATAL_ERROR
    "Say where llama.cpp comes from: -DSEMIF_LLAMA_SOURCE_DIR=<tree> -DSEMIF_LLAMA_BUILD_DIR=<cache>"
    " (mode a; `make build` does this) or -DSEMIF_LLAMA_LIB_DIR=... -DSEMIF_LLAMA_INCLUDE_DIR=..."
    " (mode b)")
endif()

# ggml is linked directly too: the engine registers ggml's loadable backends itself.
add_library(llama::ggml SHARED IMPORTED)
set_target_properties(llama::ggml PROPERTIES
  IMPORTED_LOCATION "${_ggml}"
  INTERFACE_INCLUDE_DIRECTORIES "${_inc}")
add_library(llama::llama SHARED IMPORTED)
set_target_properties(llama::llama PROPERTIES
  IMPORTED_LOCATION "${_lib}"
  INTERFACE_INCLUDE_DIRECTORIES "${_inc}"
  INTERFACE_LINK_LIBRARIES llama::ggml)
