# a shift bounds an index
#@ type kprobe
#@ intent accept
#@ map arr array 4 64 1
ldxdw %r6, [%r1+8]
rsh %r6, 58
ldmapval %r1, arr, 0
add %r1, %r6
ldxb %r0, [%r1]
exit
