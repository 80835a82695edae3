# submit a record that may be null
#@ type kprobe
#@ intent reject
#@ map rb ringbuf 0 0 4096
ldmap %r1, rb
mov %r2, 8
mov %r3, 0
call 131
mov %r1, %r0
mov %r2, 0
call 132
mov %r0, 0
exit
