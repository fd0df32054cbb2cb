# find_package(tvmsched CONFIG) with tvmsched_DIR=$(python -m tvmsched.runtime.native --cmakedir):
# the imported target tvmsched::engine (headers, library, and tvm-ffi behind it).
if(TARGET tvmsched::engine)
  return()
endif()
if(NOT Python_EXECUTABLE)
  find_package(Python COMPONENTS Interpreter REQUIRED)
endif()
execute_process(COMMAND "${Python_EXECUTABLE}" -m tvm_ffi.config --cmakedir
                OUTPUT_VARIABLE _tvm_ffi_dir OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(COMMAND "${Python_EXECUTABLE}" -m tvmsched.runtime.native --lib
                OUTPUT_VARIABLE _tvmsched_lib OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT EXISTS "${_tvmsched_lib}")
  message(FATAL_ERROR "tvmsched: the engine library '${_tvmsched_lib}' is not built (run `make setup` in the tvmsched "
                      "checkout) or ${Python_EXECUTABLE} is not the Python tvmsched is installed in")
endif()
find_package(tvm_ffi CONFIG REQUIRED PATHS "${_tvm_ffi_dir}")
find_package(Threads REQUIRED)
add_library(tvmsched::engine SHARED IMPORTED)
set_target_properties(tvmsched::engine PROPERTIES
  IMPORTED_LOCATION "${_tvmsched_lib}"
  INTERFACE_INCLUDE_DIRECTORIES "${CMAKE_CURRENT_LIST_DIR}/../include"
  INTERFACE_LINK_LIBRARIES "tvm_ffi::shared;Threads::Threads")
set(tvmsched_FOUND TRUE)
