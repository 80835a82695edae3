# compare-and-exchange with an uninitialised r0
#@ type kprobe
#@ intent reject
stdw [%r10-8], 5
mov %r1, 6
lock cmpxchg [%r10-8], %r1
mov %r0, 0
exit
