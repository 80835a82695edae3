# adding a pointer to a pointer
#@ type kprobe
#@ intent reject
mov %r2, %r10
add %r2, %r1
mov %r0, 0
exit
