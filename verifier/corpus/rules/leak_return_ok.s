# a privileged program may return a pointer (the value is ignored)
#@ type kprobe
#@ intent accept
mov %r0, %r1
exit
