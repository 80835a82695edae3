# storing an uninitialised register
#@ type kprobe
#@ intent reject
stxdw [%r10-8], %r4
mov %r0, 0
exit
