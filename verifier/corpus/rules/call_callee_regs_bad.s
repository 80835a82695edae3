# the callee reads the caller's r6
#@ type kprobe
#@ intent reject
mov %r6, 1
mov %r1, 2
call local f
exit
f:
mov %r0, %r6
exit
