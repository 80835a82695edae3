# the context pointer survives a spill and fill
#@ type kprobe
#@ intent accept
stxdw [%r10-8], %r1
ldxdw %r6, [%r10-8]
ldxdw %r0, [%r6+16]
exit
