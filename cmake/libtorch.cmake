# LibTorch from the python that has torch (the repo's .venv here, the system python on a GPU machine),
# as an INTERFACE target `libtorch`; shared by the main build and fuzz/. Set ARCHSPACE_REPO_ROOT first, and
# ARCHSPACE_TORCH_CUDA OFF to leave out the CUDA libraries.
#
# We link LibTorch's libraries directly rather than through TorchConfig.cmake: that config probes for a
# GPU and the CUDA compiler at configure time, which fails on a machine with the CUDA toolkit but no GPU.
# Our own CUDA code (the fused training kernels) is compiled without LibTorch's headers, so headers and libraries
# suffice.
set(ARCHSPACE_PYTHON "" CACHE FILEPATH "python with torch installed (default: .venv/bin/python, else python3)")
if(NOT ARCHSPACE_PYTHON)
  if(EXISTS ${ARCHSPACE_REPO_ROOT}/.venv/bin/python)
    set(ARCHSPACE_PYTHON ${ARCHSPACE_REPO_ROOT}/.venv/bin/python)
  else()
    set(ARCHSPACE_PYTHON python3)
  endif()
endif()
execute_process(
  COMMAND ${ARCHSPACE_PYTHON} -c "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  OUTPUT_VARIABLE torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE torch_found)
if(NOT torch_found EQUAL 0)
  message(FATAL_ERROR "${ARCHSPACE_PYTHON} cannot import torch: run scripts/setup.sh (or pass -DARCHSPACE_PYTHON=...)")
endif()
string(REPLACE "\n" ";" torch_info "${torch_info}")
list(GET torch_info 0 TORCH_DIR)
list(GET torch_info 1 TORCH_CXX11_ABI)
message(STATUS "LibTorch from ${TORCH_DIR} (python ${ARCHSPACE_PYTHON})")
add_library(libtorch INTERFACE)
target_include_directories(libtorch SYSTEM INTERFACE ${TORCH_DIR}/include ${TORCH_DIR}/include/torch/csrc/api/include)
target_compile_definitions(libtorch INTERFACE _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})
set(torch_libs ${TORCH_DIR}/lib/libtorch.so ${TORCH_DIR}/lib/libtorch_cpu.so ${TORCH_DIR}/lib/libc10.so)
if(NOT DEFINED ARCHSPACE_TORCH_CUDA OR ARCHSPACE_TORCH_CUDA)
  if(EXISTS ${TORCH_DIR}/lib/libtorch_cuda.so)
    # --no-as-needed: nothing references the CUDA library by symbol, but loading it registers the CUDA backend.
    list(APPEND torch_libs -Wl,--no-as-needed ${TORCH_DIR}/lib/libtorch_cuda.so ${TORCH_DIR}/lib/libc10_cuda.so -Wl,--as-needed)
  endif()
endif()
# libtorch.so exports its own copy of std::filesystem, and some of it (remove_all) crashes when called from
# our code: list libstdc++ first so the dynamic linker binds std:: symbols to the system library.
target_link_libraries(libtorch INTERFACE -Wl,--push-state,--no-as-needed stdc++ -Wl,--pop-state ${torch_libs})
set(CMAKE_BUILD_RPATH ${TORCH_DIR}/lib)
set(TORCH_LIBRARIES libtorch)
