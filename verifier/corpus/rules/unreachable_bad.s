# an instruction no path reaches
#@ type kprobe
#@ intent reject
mov %r0, 0
exit
mov %r0, 1
exit
