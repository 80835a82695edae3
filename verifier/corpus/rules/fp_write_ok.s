# the frame pointer is copied, not written
#@ type kprobe
#@ intent accept
mov %r1, %r10
mov %r0, 0
exit
