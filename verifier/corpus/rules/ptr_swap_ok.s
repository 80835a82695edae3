# byte-swapping a pointer gives privileged programs a number
#@ type kprobe
#@ intent accept
mov %r2, %r1
be64 %r2
mov %r0, %r2
exit
