# a shift that leaves the index up to 127
#@ type kprobe
#@ intent reject
#@ map arr array 4 64 1
ldxdw %r6, [%r1+8]
rsh %r6, 57
ldmapval %r1, arr, 0
add %r1, %r6
ldxb %r0, [%r1]
exit
