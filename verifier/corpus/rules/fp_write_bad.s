# the frame pointer is written
#@ type kprobe
#@ intent reject
mov %r10, 0
mov %r0, 0
exit
