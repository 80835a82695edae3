# a bounded index survives a spill and fill
#@ type kprobe
#@ intent accept
#@ map arr array 4 64 1
ldxdw %r6, [%r1+8]
and %r6, 63
stxdw [%r10-8], %r6
ldxdw %r6, [%r10-8]
ldmapval %r1, arr, 0
add %r1, %r6
ldxb %r0, [%r1]
exit
