# r2 does not survive a call
#@ type kprobe
#@ intent reject
mov %r2, 5
call local f
mov %r0, %r2
exit
f:
mov %r0, 0
exit
