# an ALU operation on an initialised register
#@ type kprobe
#@ intent accept
mov %r4, 3
add %r4, 4
mov %r0, %r4
exit
