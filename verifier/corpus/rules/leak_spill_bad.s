# spilling 4 bytes of a pointer
#@ type kprobe
#@ intent reject
stxw [%r10-8], %r1
mov %r0, 0
exit
