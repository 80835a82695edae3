# an argument register the caller never set
#@ type kprobe
#@ intent reject
mov %r1, 5
call local f
exit
f:
mov %r0, %r1
add %r0, %r2
exit
