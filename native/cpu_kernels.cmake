# The CPU kernel library, one definition for every CPU plugin (included by
# plugin_cpu_x86, plugin_cpu_arm and plugin_s390x through their `native` link, and by
# native/CMakeLists.txt for `make test-cross`).
#
# ck_add_kernels(<target> <arch> <output name>) builds a shared library of plain C entry
# points (no Python or torch ABI; called through ctypes) for the target processor when it
# is <arch> (x86_64, aarch64 or s390x): the kernel sources compiled once per ISA variant
# of that processor with the variant's flags, plus the baseline-ISA feature detection
# that lets the caller pick ck_<isa>_* at load time. For another processor it sets
# <target>_BUILT to FALSE and builds nothing: the plugin then installs without kernels
# and reports itself unavailable.
cmake_minimum_required(VERSION 3.18)
set(CK_SOURCE_DIR ${CMAKE_CURRENT_LIST_DIR}/src)

# ISA variants per processor, best first (the order ck_isa_names() reports), and flags
set(CK_x86_64_ISAS avx512amx avx512bf16 avx512vnni avx512 avx2 scalar)
set(CK_x86_64_avx2_FLAGS -mavx2 -mfma -mf16c)
set(CK_x86_64_avx512_FLAGS -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq
    -mprefer-vector-width=512)
set(CK_x86_64_avx512vnni_FLAGS ${CK_x86_64_avx512_FLAGS} -mavx512vnni)
set(CK_x86_64_avx512bf16_FLAGS ${CK_x86_64_avx512vnni_FLAGS} -mavx512bf16)
set(CK_x86_64_avx512amx_FLAGS ${CK_x86_64_avx512bf16_FLAGS} -mamx-tile -mamx-bf16)
set(CK_aarch64_ISAS neon_bf16 neon_dotprod neon scalar)
set(CK_aarch64_neon_FLAGS -march=armv8-a)
set(CK_aarch64_neon_dotprod_FLAGS -march=armv8.2-a+dotprod)
set(CK_aarch64_neon_bf16_FLAGS -march=armv8.2-a+dotprod+fp16+bf16)
set(CK_s390x_ISAS z15 z14 scalar)
set(CK_s390x_z14_FLAGS -march=z14 -mzvector)
set(CK_s390x_z15_FLAGS -march=z15 -mzvector)
# the scalar variant: plain C++ for the baseline ISA (the compiler may still vectorize it)
set(CK_SCALAR_FLAGS -DCK_NO_SIMD)

function(ck_processor out)
  string(TOLOWER "${CMAKE_SYSTEM_PROCESSOR}" p)
  if(p MATCHES "^(x86_64|amd64)$")
    set(${out} x86_64 PARENT_SCOPE)
  elseif(p MATCHES "^(aarch64|arm64)$")
    set(${out} aarch64 PARENT_SCOPE)
  elseif(p STREQUAL "s390x")
    set(${out} s390x PARENT_SCOPE)
  else()
    set(${out} "${p}" PARENT_SCOPE)
  endif()
endfunction()

function(ck_add_kernels target arch output)
  ck_processor(proc)
  if(NOT proc STREQUAL arch)
    message(STATUS "${target}: kernels are for ${arch}, this build targets ${proc}: none built")
    set(${target}_BUILT FALSE PARENT_SCOPE)
    return()
  endif()
  set(CMAKE_CXX_STANDARD 20)
  set(CMAKE_CXX_STANDARD_REQUIRED ON)
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  find_package(Threads REQUIRED)
  set(common_flags -O3 -fno-math-errno -fno-trapping-math -ffp-contract=fast -Wall -Wextra
      -Wno-unused-parameter)
  set(kernel_sources elementwise.cpp attention.cpp quant.cpp matvec.cpp decode.cpp lora.cpp encoder.cpp moe.cpp)
  list(TRANSFORM kernel_sources PREPEND ${CK_SOURCE_DIR}/)

  add_library(${target} SHARED ${CK_SOURCE_DIR}/features_${arch}.cpp ${CK_SOURCE_DIR}/features.cpp
              ${CK_SOURCE_DIR}/pool.cpp ${CK_SOURCE_DIR}/shm_comm.cpp
              ${CK_SOURCE_DIR}/bind.cpp)
  foreach(isa ${CK_${arch}_ISAS})
    set(obj ${target}_${isa})
    add_library(${obj} OBJECT ${kernel_sources})
    target_compile_definitions(${obj} PRIVATE CK_ISA=${isa})
    if(isa STREQUAL "scalar")
      target_compile_options(${obj} PRIVATE ${common_flags} ${CK_SCALAR_FLAGS})
    else()
      target_compile_options(${obj} PRIVATE ${common_flags} ${CK_${arch}_${isa}_FLAGS})
    endif()
    target_link_libraries(${obj} PRIVATE OpenMP::OpenMP_CXX)
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:${obj}>)
  endforeach()
  target_compile_options(${target} PRIVATE ${common_flags})
  target_link_libraries(${target} PRIVATE OpenMP::OpenMP_CXX Threads::Threads)
  # named like an extension module so importlib finds it in regular and editable installs
  set_target_properties(${target} PROPERTIES PREFIX "" OUTPUT_NAME "${output}" SUFFIX ".so")
  set(${target}_BUILT TRUE PARENT_SCOPE)
endfunction()
