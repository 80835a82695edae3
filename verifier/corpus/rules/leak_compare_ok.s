# privileged programs may compare pointers
#@ type kprobe
#@ intent accept
mov %r0, 0
mov %r2, %r10
jgt %r2, %r1, +1
mov %r0, 1
exit
