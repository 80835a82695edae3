# r1-r5 pass arguments; r0 carries the result back
#@ type kprobe
#@ intent accept
mov %r1, 5
mov %r2, 6
call local f
exit
f:
mov %r0, %r1
add %r0, %r2
exit
