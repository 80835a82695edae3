# spilling a pointer takes the whole 8 bytes
#@ type kprobe
#@ intent accept
stxdw [%r10-8], %r1
mov %r0, 0
exit
