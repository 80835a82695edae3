# returning with a ring buffer record still held
#@ type kprobe
#@ intent reject
#@ map rb ringbuf 0 0 4096
ldmap %r1, rb
mov %r2, 8
mov %r3, 0
call 131
exit
