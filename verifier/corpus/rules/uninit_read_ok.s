# r3 is set before it is read
#@ type kprobe
#@ intent accept
mov %r3, 1
mov %r0, %r3
exit
