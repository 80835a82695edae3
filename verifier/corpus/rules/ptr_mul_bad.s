# multiplying a pointer
#@ type kprobe
#@ intent reject
mul %r1, 3
mov %r0, 0
exit
