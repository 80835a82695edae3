# r0 is set before exit
#@ type kprobe
#@ intent accept
mov %r0, 0
exit
