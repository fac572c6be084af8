# The SM120 host checks (tests/sm120_host/*.cu) as CMake targets, for work on the kernels without
# Python. tests/test_sm120_host.py builds the same programs with the same manifest flags and runs them
# (reference_test reads the inputs that test writes); tests/test_sm120_grouped_host.py the grouped ones (the
# layout and reference programs are the SM100 host directory's, shared: the grouped arguments are the same). Included by the top-level CMakeLists.txt.
set(NVFP4_SM120_HOST_DIR ${CMAKE_CURRENT_SOURCE_DIR}/tests/sm120_host)
foreach(prog layout_test reference_test can_implement_test)
  add_executable(sm120_${prog} ${NVFP4_SM120_HOST_DIR}/${prog}.cu)
  target_include_directories(sm120_${prog} PRIVATE
    ${CMAKE_CURRENT_SOURCE_DIR}/csrc ${NVFP4_CUTLASS_INCLUDE_DIRS})
  target_compile_options(sm120_${prog} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${NVFP4_COMMON_NVCC_FLAGS}>)
endforeach()
add_executable(sm120_grouped_can_implement_test ${NVFP4_SM120_HOST_DIR}/grouped_can_implement_test.cu)
target_include_directories(sm120_grouped_can_implement_test PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc ${NVFP4_CUTLASS_INCLUDE_DIRS})
target_compile_options(sm120_grouped_can_implement_test PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${NVFP4_COMMON_NVCC_FLAGS}>)
# can_implement_test links the real dispatch code and is compiled for the module's own target.
target_sources(sm120_can_implement_test PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/sm120/api.cpp ${CMAKE_CURRENT_SOURCE_DIR}/csrc/sm120/select.cpp)
target_compile_options(sm120_can_implement_test PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${NVFP4_C_sm120_GENCODE}>)
# grouped_api.cpp (the first-use self-check) calls the CUDA runtime: its C++ compile needs the toolkit's headers.
target_include_directories(sm120_grouped_can_implement_test PRIVATE ${CMAKE_CUDA_TOOLKIT_INCLUDE_DIRECTORIES})
target_sources(sm120_grouped_can_implement_test PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/sm120/grouped_api.cpp ${CMAKE_CURRENT_SOURCE_DIR}/csrc/sm120/select.cpp)
target_compile_options(sm120_grouped_can_implement_test PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${NVFP4_C_sm120_GENCODE}>)
