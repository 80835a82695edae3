# storing an initialised register
#@ type kprobe
#@ intent accept
mov %r4, 1
stxdw [%r10-8], %r4
mov %r0, 0
exit
