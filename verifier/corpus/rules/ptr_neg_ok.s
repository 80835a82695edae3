# negating a pointer gives privileged programs a number
#@ type kprobe
#@ intent accept
mov %r2, %r10
neg %r2
mov %r0, %r2
exit
