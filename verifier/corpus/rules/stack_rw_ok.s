# write then read a stack slot
#@ type kprobe
#@ intent accept
stdw [%r10-8], 42
ldxdw %r0, [%r10-8]
exit
