# The SM100 host checks (tests/sm100_host/*.cu) as CMake targets, for work on the kernels without
# Python. tests/test_sm100_host.py builds the same programs with the same manifest flags and runs them
# (reference_test reads the inputs that test writes); tests/test_sm100_grouped_host.py the grouped_* and
# selfcheck_case_test programs. Included by the top-level CMakeLists.txt.
set(NVFP4_SM100_HOST_DIR ${CMAKE_CURRENT_SOURCE_DIR}/tests/sm100_host)
foreach(prog layout_test reference_test can_implement_test grouped_layout_test grouped_reference_test
             grouped_can_implement_test selfcheck_case_test)
  add_executable(sm100_${prog} ${NVFP4_SM100_HOST_DIR}/${prog}.cu)
  target_include_directories(sm100_${prog} PRIVATE
    ${CMAKE_CURRENT_SOURCE_DIR}/csrc ${NVFP4_CUTLASS_INCLUDE_DIRS})
  target_compile_options(sm100_${prog} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${NVFP4_COMMON_NVCC_FLAGS}>)
endforeach()
# can_implement_test links the real dispatch code and is compiled for the module's own target.
target_sources(sm100_can_implement_test PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/sm100/api.cpp ${CMAKE_CURRENT_SOURCE_DIR}/csrc/sm100/select.cpp)
target_compile_options(sm100_can_implement_test PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${NVFP4_C_sm100_GENCODE}>)
# grouped_api.cpp (the first-use self-check) calls the CUDA runtime: its C++ compile needs the toolkit's headers.
target_include_directories(sm100_grouped_can_implement_test PRIVATE ${CMAKE_CUDA_TOOLKIT_INCLUDE_DIRECTORIES})
target_sources(sm100_grouped_can_implement_test PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/sm100/grouped_api.cpp ${CMAKE_CURRENT_SOURCE_DIR}/csrc/sm100/select.cpp)
target_compile_options(sm100_grouped_can_implement_test PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${NVFP4_C_sm100_GENCODE}>)
