# src/cpu/kernels.cc (with cpu/block.cc, whose loops its table names) once per x86 instruction set,
# as ATen builds its own CPU kernels: the baseline x86-64 (DEFAULT), AVX2 + FMA, and AVX-512 (F, BW,
# VL, DQ), each with ATen's CPU_CAPABILITY macros (its Vectorized<float> is then 8 or 16 lanes wide)
# and in a namespace of its own;
# src/cpu_kernels.cc picks one for the CPU at run time. Elsewhere than x86-64 only DEFAULT.
# The objects are linked after the addon's other sources, DEFAULT first: of an inline function
# compiled in several of them (a libstdc++ template, say), the linker keeps the first copy, which is
# then one for the baseline instruction set.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(_prime_cpu_caps DEFAULT AVX2 AVX512)
  # Only the file that picks a copy needs to know the others exist (the addon's other sources keep
  # the flags of a build without this file, and so their compiler-cache entries).
  set_source_files_properties(${CMAKE_SOURCE_DIR}/src/cpu_kernels.cc PROPERTIES COMPILE_DEFINITIONS PRIME_CPU_KERNELS_X86)
else()
  set(_prime_cpu_caps DEFAULT)
endif()
set(_prime_cpu_flags_DEFAULT "")
set(_prime_cpu_flags_AVX2 -mavx2 -mfma -mf16c -mbmi -mbmi2)
set(_prime_cpu_flags_AVX512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mbmi -mbmi2)
foreach(_cap ${_prime_cpu_caps})
  set(_t prime_cpu_kernels_${_cap})
  add_library(${_t} OBJECT ${CMAKE_SOURCE_DIR}/src/cpu/kernels.cc ${CMAKE_SOURCE_DIR}/src/cpu/block.cc)
  set_target_properties(${_t} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_include_directories(${_t} PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(${_t} PRIVATE CPU_CAPABILITY=${_cap} CPU_CAPABILITY_${_cap})
  target_compile_options(${_t} PRIVATE -O3 -fopenmp-simd -fno-trapping-math -fno-math-errno -Wall
                                       -Wno-unused-parameter ${_prime_cpu_flags_${_cap}})
  # libtorch's include directories and definitions (its targets' usage requirements).
  target_link_libraries(${_t} PRIVATE ${TORCH_LINK})
  target_include_directories(${_t} SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
  target_sources(${PROJECT_NAME} PRIVATE $<TARGET_OBJECTS:${_t}>)
endforeach()
