# a function called twice, not from itself
#@ type kprobe
#@ intent accept
call local f
call local f
exit
f:
mov %r0, 1
exit
