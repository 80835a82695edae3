# a 32-bit comparison bounds a 32-bit index
#@ type kprobe
#@ intent accept
#@ map arr array 4 64 1
ldxw %r6, [%r1+8]
ldmapval %r1, arr, 0
jlt32 %r6, 64, +2
mov %r0, 0
exit
add %r1, %r6
ldxb %r0, [%r1]
exit
