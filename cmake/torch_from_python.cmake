# libtorch as a Python environment's torch package ships it (PyPI's wheels: torch 2.x),
# for -DCHORUS_TORCH_PYTHON=/path/to/venv/bin/python.
#
# PyPI's Linux wheels are CUDA builds. Their find_package(Torch) configuration looks for
# the CUDA toolkit, cuDNN and NVTX and links the CUDA half of libtorch into every
# program; chorus computes on the CPU, so it takes the paths torch itself gives its C++
# extensions (torch.utils.cpp_extension) and links the CPU half only: libc10 and
# libtorch_cpu (libtorch_python too for the Python module). The result looks like what
# find_package(Torch) leaves behind: Torch_FOUND, TORCH_LIBRARIES (an imported target),
# TORCH_CXX_FLAGS, TORCH_INSTALL_PREFIX, and TORCH_VERSION from the package.
#
# The ABI flag (_GLIBCXX_USE_CXX11_ABI) is the package's own: every torch wheel since 2.7
# is built with the C++11 ABI, older ones were not, and mixing them fails at link time.

execute_process(
  COMMAND "${CHORUS_TORCH_PYTHON}" -c [=[
import os, sys, warnings
warnings.simplefilter("ignore")
import logging; logging.disable(logging.CRITICAL)
import torch
from torch.utils import cpp_extension as ext
print(torch.__version__.split("+")[0])
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(os.path.dirname(torch.__file__))
print(",".join(ext.include_paths()))
print(",".join(ext.library_paths()))
]=]
  OUTPUT_VARIABLE _chorus_torch_info
  ERROR_VARIABLE _chorus_torch_error
  RESULT_VARIABLE _chorus_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _chorus_torch_rc EQUAL 0)
  message(FATAL_ERROR "CHORUS_TORCH_PYTHON=${CHORUS_TORCH_PYTHON} cannot import torch:\n${_chorus_torch_error}")
endif()
string(REPLACE "\n" ";" _chorus_torch_info "${_chorus_torch_info}")
list(LENGTH _chorus_torch_info _chorus_torch_lines)
if(NOT _chorus_torch_lines EQUAL 5)
  message(FATAL_ERROR "CHORUS_TORCH_PYTHON=${CHORUS_TORCH_PYTHON}: unexpected answer from torch: ${_chorus_torch_info}")
endif()
list(GET _chorus_torch_info 0 TORCH_VERSION)
list(GET _chorus_torch_info 1 _chorus_torch_abi)
list(GET _chorus_torch_info 2 TORCH_INSTALL_PREFIX)
list(GET _chorus_torch_info 3 _chorus_torch_includes)
list(GET _chorus_torch_info 4 _chorus_torch_libdir)
string(REPLACE "," ";" _chorus_torch_includes "${_chorus_torch_includes}")
string(REPLACE "," ";" _chorus_torch_libdir "${_chorus_torch_libdir}")

foreach(lib c10 torch_cpu torch_python)
  find_library(CHORUS_TORCH_${lib}_LIBRARY ${lib} PATHS ${_chorus_torch_libdir} NO_DEFAULT_PATH REQUIRED)
endforeach()

add_library(chorus_libtorch INTERFACE IMPORTED GLOBAL)
target_include_directories(chorus_libtorch SYSTEM INTERFACE ${_chorus_torch_includes})
target_compile_definitions(chorus_libtorch INTERFACE _GLIBCXX_USE_CXX11_ABI=${_chorus_torch_abi})
target_link_libraries(chorus_libtorch INTERFACE ${CHORUS_TORCH_torch_cpu_LIBRARY}
                      ${CHORUS_TORCH_c10_LIBRARY} Threads::Threads)
# Programs find libtorch where the package keeps it, without LD_LIBRARY_PATH.
target_link_options(chorus_libtorch INTERFACE "LINKER:-rpath,${_chorus_torch_libdir}")

set(Torch_FOUND TRUE)
set(TORCH_LIBRARIES chorus_libtorch)
set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=${_chorus_torch_abi}")
set(CHORUS_TORCH_PYTHON_LIBRARY ${CHORUS_TORCH_torch_python_LIBRARY})
# The wheel ships the pybind11 headers its torch was built with (pybind11 3 from torch
# 2.9): an extension must use those, not Debian's pybind11 2.10.
set(CHORUS_TORCH_BUNDLES_PYBIND11 TRUE)
message(STATUS "torch ${TORCH_VERSION} from ${CHORUS_TORCH_PYTHON} (${TORCH_INSTALL_PREFIX}), C++11 ABI ${_chorus_torch_abi}")
