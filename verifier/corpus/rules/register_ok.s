# registers r0-r10
#@ type kprobe
#@ intent accept
mov %r9, 1
mov %r0, %r9
exit
