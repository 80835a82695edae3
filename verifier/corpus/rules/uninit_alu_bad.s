# an ALU operation on an uninitialised register
#@ type kprobe
#@ intent reject
add %r4, 4
mov %r0, %r4
exit
