# the callee only reads its arguments
#@ type kprobe
#@ intent accept
mov %r6, 1
mov %r1, 2
call local f
exit
f:
mov %r0, %r1
exit
