# register r11
#@ type kprobe
#@ intent reject
.raw 0x0000000000001bbf
mov %r0, 0
exit
