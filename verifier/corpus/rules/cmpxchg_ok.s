# compare-and-exchange on a stack slot
#@ type kprobe
#@ intent accept
stdw [%r10-8], 5
mov %r0, 5
mov %r1, 6
lock cmpxchg [%r10-8], %r1
exit
