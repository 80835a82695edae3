# a 64-bit swap of a wide constant is still wide: no small map offset
#@ type kprobe
#@ intent reject
#@ map arr array 4 16 1
lddw %r2, 0x100000000
le64 %r2
ldmapval %r1, arr, 0
add %r1, %r2
ldxb %r0, [%r1]
exit
