# an index narrowed by jle to 64, one past the value
#@ type kprobe
#@ intent reject
#@ map arr array 4 64 1
ldxdw %r6, [%r1+8]
ldmapval %r1, arr, 0
jle %r6, 64, +2
mov %r0, 0
exit
add %r1, %r6
ldxb %r0, [%r1]
exit
