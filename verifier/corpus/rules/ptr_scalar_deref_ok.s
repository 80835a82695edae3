# a load through the stack pointer
#@ type kprobe
#@ intent accept
stdw [%r10-8], 5
ldxdw %r0, [%r10-8]
exit
