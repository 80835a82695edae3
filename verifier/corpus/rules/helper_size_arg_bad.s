# a pointer as the size
#@ type kprobe
#@ intent reject
mov %r1, %r10
add %r1, -16
mov %r2, %r10
call 16
mov %r0, 0
exit
