# a pointer minus a pointer into the same stack is a number
#@ type kprobe
#@ intent accept
mov %r2, %r10
add %r2, -8
mov %r3, %r10
sub %r3, %r2
mov %r0, %r3
exit
