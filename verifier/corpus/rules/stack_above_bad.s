# a read that ends past the frame pointer
#@ type kprobe
#@ intent reject
stdw [%r10-8], 3
ldxh %r0, [%r10-1]
exit
