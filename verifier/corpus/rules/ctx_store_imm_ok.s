# store an immediate to the stack, not the context
#@ type kprobe
#@ intent accept
stdw [%r10-8], 7
mov %r0, 0
exit
