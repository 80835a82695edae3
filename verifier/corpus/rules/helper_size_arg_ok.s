# a number as the size
#@ type kprobe
#@ intent accept
mov %r1, %r10
add %r1, -16
mov %r2, 16
call 16
mov %r0, 0
exit
