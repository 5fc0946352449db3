# Cross build for s390x Linux (big-endian) with Debian's g++-s390x-linux-gnu; tests run
# under qemu-user with the target's libraries (-L).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR s390x)
set(CMAKE_CXX_COMPILER s390x-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/s390x-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-s390x -L /usr/s390x-linux-gnu)
# QEMU 7.2 (Debian 12) emulates up to the z14's vector-enhancements facility 1 and refuses
# the named models under TCG (their crypto features): `max` is a z14 (the z14 path),
# `max,vxeh=off` a z13 (vector registers, no vector float32: the scalar fallback). The
# z15 path (VXE2) needs QEMU >= 8.1 (its -cpu max) and is reported as not run before that.
set(CK_TEST_CPUS "max;max,vxeh=off" CACHE STRING "")
