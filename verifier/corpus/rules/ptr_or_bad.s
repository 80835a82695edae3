# or on a pointer
#@ type kprobe
#@ intent reject
or %r1, 6
mov %r0, 0
exit
