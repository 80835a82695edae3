# a context pointer refilled at 4 bytes is not a pointer
#@ type kprobe
#@ intent reject
stxdw [%r10-8], %r1
ldxw %r6, [%r10-8]
ldxdw %r0, [%r6+16]
exit
