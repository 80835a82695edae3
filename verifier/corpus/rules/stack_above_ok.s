# a read that ends at the frame pointer
#@ type kprobe
#@ intent accept
stdw [%r10-8], 3
ldxb %r0, [%r10-1]
exit
