# the fill of a different slot loses the bound
#@ type kprobe
#@ intent reject
#@ map arr array 4 64 1
ldxdw %r6, [%r1+8]
ldxdw %r7, [%r1+16]
and %r6, 63
stxdw [%r10-8], %r6
stxdw [%r10-16], %r7
ldxdw %r6, [%r10-16]
ldmapval %r1, arr, 0
add %r1, %r6
ldxb %r0, [%r1]
exit
