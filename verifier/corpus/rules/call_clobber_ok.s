# r6 survives a call
#@ type kprobe
#@ intent accept
mov %r6, 5
call local f
mov %r0, %r6
exit
f:
mov %r0, 0
exit
